from eval_svc.follower import main

if __name__ == "__main__":
    main()
